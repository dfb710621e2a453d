"""``python -m anysr.test -opt F`` (as BasicSR's ``basicsr/test.py``)."""

from anysr.cli import test_main

if __name__ == "__main__":
    test_main()
