"""Where the lab finds the checkout it runs from (``make setup`` installs it editable): examples/, configs/, .cache/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
