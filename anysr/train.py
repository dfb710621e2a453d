"""``python -m anysr.train -opt F`` (as BasicSR's ``basicsr/train.py``)."""

from anysr.cli import train_main

if __name__ == "__main__":
    train_main()
