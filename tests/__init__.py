"""The test suite as a package, so that every test module imports its helpers one way,
``from tests.helpers.NAME import ...``, however pytest is started (pytest puts the repository
root on ``sys.path`` for a package of tests). Test modules import helpers, never each other.
"""
