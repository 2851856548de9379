"""Reading a user's CSV file row by row, hardened against what a wrong file holds (issue 12).

Every CSV reader of the core (traces, throughput tables) goes through ``csv_rows``: a binary
file, bytes that are not UTF-8, NUL characters and lone surrogates, a cell over
``MAX_CELL_CHARS`` or a line over ``MAX_LINE_CHARS`` characters give one ``InputError`` naming
file, line and column (``scheduler.inputs``), never a traceback.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from scheduler.inputs import MAX_CELL_CHARS, MAX_LINE_CHARS, InputError, check_text, sniff_binary


def csv_rows(path: str | Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row; checks the header has ``required`` columns.

    Hardened against what a wrong file holds (issue 12): a binary file, bytes that are not
    UTF-8, NUL characters and lone surrogates, a cell over ``MAX_CELL_CHARS`` or a line over
    ``MAX_LINE_CHARS`` characters each give one ``InputError`` naming file, line and column,
    never a traceback. Rows are read lazily: the error comes at the first bad row.
    """
    sniff_binary(path)
    try:
        # surrogateescape: a byte that is not UTF-8 becomes a lone surrogate, reported with
        # its line and column by check_text rather than as a decoding traceback.
        f = open(path, newline="", encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", file=path) from exc
    try:
        header: list[str] = []
        reader = csv.reader(_bounded_lines(f, path, header))
        try:
            first = next(reader, [])
            header.extend(h.strip() for h in first)
            for i, name in enumerate(header):
                check_text(name, file=path, line=1, field=f"column {i + 1}", limit=256)
            missing = [c for c in required if c not in header]
            if missing:
                raise InputError(
                    f"missing column(s) {', '.join(missing)}; header is "
                    f"{', '.join(header) or 'empty'}",
                    file=path,
                    line=1,
                    field=missing[0],
                )
            for cells in reader:
                line = reader.line_num
                if not any(c.strip() for c in cells):
                    continue  # blank line
                row: dict[str, str] = {}
                for name, cell in zip(header, cells, strict=False):
                    if name:
                        row[name] = check_text(cell.strip(), file=path, line=line, field=name)
                yield line, row
        except csv.Error as exc:
            raise InputError(
                f"not a readable CSV row ({exc})", file=path, line=reader.line_num
            ) from None
    finally:
        f.close()


def _bounded_lines(f: Iterable[str], path: str | Path, header: list[str]) -> Iterator[str]:
    """The lines of ``f``; InputError for a line over ``MAX_LINE_CHARS`` characters, naming
    the column whose cell overflows (``header``: the parsed header, once known)."""
    for number, line in enumerate(f, start=1):
        if len(line) > MAX_LINE_CHARS:
            field = None
            if header:
                cells = next(csv.reader([line[:MAX_LINE_CHARS]]), [])
                if cells:
                    index = len(cells) - 1
                    field = header[index] if index < len(header) else f"column {index + 1}"
            raise InputError(
                f"a line of {len(line):,} characters; at most {MAX_LINE_CHARS:,} "
                f"(cells at most {MAX_CELL_CHARS:,})",
                file=path,
                line=number,
                field=field,
            )
        yield line


def csv_header(path: str | Path) -> list[str]:
    """The column names of a CSV file (stripped), or InputError if unreadable or binary."""
    sniff_binary(path)
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            first = next(_bounded_lines(f, path, []), "")
            return [h.strip() for h in next(csv.reader([first]), [])]
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", file=path) from exc
    except csv.Error as exc:
        raise InputError(f"not a readable CSV header ({exc})", file=path, line=1) from None
