#!/usr/bin/env python3
"""The size rules (docs/architecture.md, "Size rules"):
no source file over 700 lines and no function over 100 lines, outside
tests/, bench/ and fuzz/. Run at configure time (cmake/H2Layers.cmake) and
as the CTest test "source_lengths":

    python3 cmake/h2_check_lengths.py <repository root>

A function is what clang-format leaves at column 0: a definition whose
signature starts at column 0 and whose body ends with a line "}" at
column 0 (free functions, member functions defined outside their class,
lambdas included in the function that holds them). Lines inside raw string
literals do not start or end one.
"""
import pathlib
import re
import sys

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100
CHECKED = ("core", "corpus", "devices", "transport", "model", "scheduler",
           "metrics", "runtime", "actors", "apps")
NOT_A_START = re.compile(
    r"^(#|//|/\*|\*|\}|namespace\b|class\b|struct\b|enum\b|union\b|using\b|"
    r"template\b|extern\b|static_assert\b|$)")
ACCESS = re.compile(r"^(public|private|protected):")
RAW_OPEN = re.compile(r'R"([^(\s]*)\(')


def functions(lines):
    """(signature's first line, its number, length) of each column-0
    function."""
    start = None
    raw_end = None
    for number, line in enumerate(lines, 1):
        if raw_end is not None:
            if raw_end in line:
                raw_end = None
            continue
        opened = RAW_OPEN.search(line)
        if opened and (")" + opened.group(1) + '"') not in line[opened.end():]:
            raw_end = ")" + opened.group(1) + '"'
        if line[:1] in (" ", "\t", ""):
            continue
        text = line.rstrip()
        if text == "}":
            if start is not None:
                yield lines[start - 1].strip(), start, number - start + 1
            start = None
        elif text.endswith(";") or ACCESS.match(text):
            start = None  # a declaration, a class's end or its sections
        elif start is None and not NOT_A_START.match(text):
            start = number


def main(root):
    root = pathlib.Path(root)
    problems = []
    for module in CHECKED:
        for path in sorted((root / module).rglob("*")):
            if path.suffix not in (".cpp", ".hpp", ".cu", ".hip"):
                continue
            rel = path.relative_to(root)
            lines = path.read_text(encoding="utf-8").split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            if len(lines) > MAX_FILE_LINES:
                problems.append(f"{rel}: {len(lines)} lines (at most "
                                f"{MAX_FILE_LINES})")
            for name, first, length in functions(lines):
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{rel}:{first}: a function of {length} "
                                    f"lines (at most {MAX_FUNCTION_LINES}): "
                                    f"{name[:70]}")
    if problems:
        print("H2: the size rules are broken:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
