#!/usr/bin/env python3
"""A TF-IDF + logistic-regression baseline for the fortune topic task (docs/language-models.md).

Reads the English fortunes as baton does (include/baton/text.hpp: links, .dat and .u8 files
skipped, overstrikes printed, trailing whitespace and blank edge lines dropped, duplicates kept
once), splits the records by the same hash of their text (val and test 5% each), keeps the topics
with at least 200 training records, and scores scikit-learn's TF-IDF (word 1-2 grams and character
2-5 grams) with logistic regression on the test part: accuracy and macro-F1.

    python3 benchmarks/tfidf_topic.py [--dir /usr/share/games/fortunes] [--check]

--check prints the record counts that tests/text_test.cpp's figures can be compared with.
"""
import argparse
import os
import sys

MASK = (1 << 64) - 1


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & MASK
    return h


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def part_of(text: bytes, val=0.05, test=0.05) -> str:
    u = (splitmix64(fnv1a(text)) >> 11) * 2.0 ** -53
    return "test" if u < test else "val" if u < test + val else "train"


def clean_overstrikes(s: bytes) -> bytes:
    if b"\b" not in s:
        return s
    out = []
    for line in s.split(b"\n"):
        cells, cursor, i = [], 0, 0
        while i < len(line):
            if line[i] == 8:
                cursor = max(cursor - 1, 0)
                i += 1
                continue
            end = i + 1
            while end < len(line) and (line[end] & 0xC0) == 0x80:
                end += 1
            c = line[i:end]
            i = end
            if cursor < len(cells):
                if c != b"_":
                    cells[cursor] = c
            else:
                cells.append(c)
            cursor += 1
        out.append(b"".join(cells))
    return b"\n".join(out)


def tidy(s: bytes) -> bytes:
    lines = [l.rstrip(b" \t\r") for l in s.split(b"\n")]
    if lines and lines[-1] == b"":  # the record's own final newline
        lines.pop()
    while lines and lines[-1] == b"":
        lines.pop()
    while lines and lines[0] == b"":
        lines.pop(0)
    return b"\n".join(lines)


def records_of(path: str):
    data = open(path, "rb").read()
    record = []
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        if line in (b"%", b"%\r"):
            yield b"".join(record)
            record = []
            continue
        record.append(line + b"\n")
    rest = b"".join(record)
    if rest.strip(b" \t\r\n"):
        yield rest


def english(dir_: str):
    seen, out, duplicates = set(), [], 0
    for name in sorted(os.listdir(dir_)):
        path = os.path.join(dir_, name)
        if os.path.islink(path) or not os.path.isfile(path) or name.endswith((".dat", ".u8")):
            continue
        for raw in records_of(path):
            text = tidy(clean_overstrikes(raw))
            text.decode("utf-8")  # every English file is UTF-8 (baton: an error otherwise)
            if not text:
                continue
            if text in seen:
                duplicates += 1
                continue
            seen.add(text)
            out.append((text, name))
    return out, duplicates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/usr/share/games/fortunes")
    ap.add_argument("--min-records", type=int, default=200)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    records, duplicates = english(a.dir)
    parts = {"train": [], "val": [], "test": []}
    for text, topic in records:
        parts[part_of(text)].append((text.decode("utf-8"), topic))
    counts = {}
    for _, t in parts["train"]:
        counts[t] = counts.get(t, 0) + 1
    classes = sorted(t for t, n in counts.items() if n >= a.min_records)
    if a.check:
        print(f"records {len(records)} duplicates {duplicates} train {len(parts['train'])} val {len(parts['val'])} "
              f"test {len(parts['test'])} classes {len(classes)}")
        return 0
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.pipeline import make_pipeline, make_union

    def pick(part):
        kept = [(x, classes.index(t)) for x, t in parts[part] if t in classes]
        return [x for x, _ in kept], [y for _, y in kept]

    xtr, ytr = pick("train")
    xte, yte = pick("test")
    model = make_pipeline(
        make_union(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2),
                   TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)),
        LogisticRegression(C=10.0, max_iter=2000))
    model.fit(xtr, ytr)
    pred = model.predict(xte)
    print(f"tfidf+logreg topic ({len(classes)} classes, {len(xtr)} train, {len(xte)} test): "
          f"accuracy {accuracy_score(yte, pred):.4f} macro_f1 {f1_score(yte, pred, average='macro'):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
