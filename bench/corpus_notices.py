"""The copyright notices of the embedded model's training files other than the Python
Software Foundation's: the attribution list of models/tiny/NOTICE.

    .venv/bin/python bench/corpus_notices.py > models/tiny/NOTICE.files

A line per training file (bench/train_tiny.py's split) whose first 120 lines carry a
copyright line naming someone else: the file and its distinct copyright lines.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.train_tiny import corpus_files, split  # noqa: E402

COPYRIGHT = re.compile(r"copyright\s*(\(c\))?\s*(\d{4}|by)", re.IGNORECASE)


def notices(path: Path) -> list[str]:
    head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:120]
    found = [line.strip(" #\t") for line in head if COPYRIGHT.search(line)]
    return list(dict.fromkeys(n for n in found if "Python Software Foundation" not in n))


def main() -> None:
    files = corpus_files()
    root = files[0].parent
    for path in split(files)[0]:
        if found := notices(path):
            print(f"{path.relative_to(root)}: " + "; ".join(found[:3]))


if __name__ == "__main__":
    main()
