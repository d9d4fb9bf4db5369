"""The device side: what runs on a board or phone. Imports numpy and a runtime, never torch."""
