"""The device side: what runs on a board or phone. Imports numpy, msgspec and a runtime, never torch."""
