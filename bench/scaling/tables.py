"""Writing the reports: Markdown tables, number formats shared by every table, numbered
assumption tags, and the report files themselves (STEM.md beside STEM.json); and the comma
lists of numbers the programs take."""

import json
import math
import os


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows])


def fmt_ms(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}g}" if x < 10 ** digits else f"{x:.0f}"


def fmt_bytes(n):
    for unit, div in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_pct(x):
    return "–" if x is None else f"{x:.0%}"


def flags(row):
    """The mark of a row whose run was oversubscribed or on a machine that was not idle."""
    return " (oversubscribed)" if row.get("oversubscribed") else (" (not idle)" if row.get("shared") else "")


def ints(text):
    """An argparse type: "1,2,4" -> [1, 2, 4]."""
    return [int(x) for x in text.split(",") if x.strip()]


class Legend:
    """Numbered assumption tags printed beside the numbers and spelled out under each table."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.items = {}

    def tag(self, text):
        if text not in self.items:
            self.items[text] = f"{self.prefix}{len(self.items) + 1}"
        return self.items[text]

    def markdown(self):
        return "\n".join(f"- **{t}**: {text}" for text, t in self.items.items())


def read_json(path):
    with open(path) as f:
        return json.load(f)


def emit_report(text, data, out_dir, stem):
    """Prints a report; with out_dir, also writes it as STEM.md and its data as STEM.json there."""
    print(text)
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(data, f, indent=1)
