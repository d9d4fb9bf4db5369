"""What the tests (and the benches that reuse them) share, one job a module.

Test modules import plain helpers from here (``from support.tables import table``); the modules that
offer fixtures are registered as pytest plugins in ``tests/conftest.py``, so a test names the fixture
and nothing imports it. Benches put ``tests/`` on ``sys.path`` to import this package.
"""
