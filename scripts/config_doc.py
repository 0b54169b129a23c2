"""Regenerate docs/config.md from the schema (rlcompare/config/schema.py and sections/: a field's comment is its help).

python scripts/config_doc.py          # rewrite docs/config.md
python scripts/config_doc.py --check  # exit 1 when docs/config.md is out of step
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlcompare.config.doc import render  # noqa: E402

if __name__ == "__main__":
    path = ROOT / "docs" / "config.md"
    text = render()
    if "--check" in sys.argv[1:]:
        sys.exit(0 if path.exists() and path.read_text() == text else 1)
    path.write_text(text)
    print(f"wrote {path}")
