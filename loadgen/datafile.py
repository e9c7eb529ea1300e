"""Reading a user's data file (a dataset, a trace): one error that names the file and the line,
and the text read once with the checks every reader wants (there, a file, UTF-8, not empty)."""

from __future__ import annotations

from pathlib import Path


class DatasetError(ValueError):
    """A bad dataset file: names the file and, when it applies, the line."""

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


def read_text(path: Path, error: type[DatasetError] = DatasetError) -> str:
    """The file's text (UTF-8, a byte-order mark dropped); ``error`` names what is wrong with it."""
    if not path.exists():
        raise error(path, "no such file")
    if not path.is_file():
        raise error(path, "not a file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(path, f"not UTF-8 text (byte {exc.start})", line) from None
    if not text.strip():
        raise error(path, "file is empty")
    return text
