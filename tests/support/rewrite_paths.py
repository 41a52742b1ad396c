#!/usr/bin/env python3
"""Rewrite the frame paths of a real PyTorch snapshot into another
environment's form, with CPython's pickler.

    rewrite_paths.py FORM IN OUT

FORM is one of:
  windows   C:\\ drive, backslashes, a .venv with Lib\\site-packages, the
            standard library under C:\\...\\Python310\\Lib
  conda     a conda environment: ~/miniconda3/envs/exp/lib/pythonX.Y/...
  debian    Debian's python: /usr/lib/python3/dist-packages, /usr/lib/pythonX.Y
  notebook  every file of the program's own code becomes an IPython cell,
            /tmp/ipykernel_4242/<number>.py

Only the path changes, never the function or the line, so snapdiff must
name the same culprit lines as for the original. Prints JSON mapping each
original file name to its new one.
"""
import json
import pickle
import re
import sys
import zlib

ENV = re.compile(r"^(.*?)/(lib|lib64)/python(\d+(?:\.\d+)?)/(site-packages/|dist-packages/)?(.*)$")


def rewrite(form, path):
    if not path.startswith("/"):
        return path  # '??', '', '<frozen runpy>', bare names
    m = ENV.match(path)
    if m:
        _, _, version, packages, rest = m.groups()
        if form == "windows":
            root = (
                "C:\\Users\\ana\\proj\\.venv\\Lib\\site-packages\\"
                if packages
                else "C:\\Users\\ana\\AppData\\Local\\Programs\\Python\\Python310\\Lib\\"
            )
            return root + rest.replace("/", "\\")
        if form == "conda":
            root = f"/home/ana/miniconda3/envs/exp/lib/python{version}/"
            return root + ("site-packages/" if packages else "") + rest
        if form == "debian":
            if packages:
                return "/usr/lib/python3/dist-packages/" + rest
            return f"/usr/lib/python{version}/" + rest
        return path
    if form == "windows":
        return "C:" + path.replace("/", "\\")
    if form == "notebook" and path.endswith(".py") and "/ipykernel_" not in path:
        # Vendored libraries keep their package folder, as in a real notebook,
        # and torch.compile's generated code its cache folder.
        if any(f"/{lib}/" in path for lib in ("transformers", "torch", "megatron", "vllm")):
            return path
        if "/torchinductor_" in path:
            return path
        return f"/tmp/ipykernel_4242/{zlib.crc32(path.encode())}.py"
    return path


def main():
    form, src, dst = sys.argv[1:4]
    snap = pickle.load(open(src, "rb"))
    mapping = {}
    seen = set()

    def fix(frames):
        for f in frames:
            if id(f) in seen:
                continue
            seen.add(id(f))
            new = rewrite(form, f["filename"])
            mapping[f["filename"]] = new
            f["filename"] = new

    for seg in snap["segments"]:
        fix(seg.get("frames", []))
        for b in seg["blocks"]:
            fix(b.get("frames", []))
            for h in b.get("history", []):
                fix(h.get("frames", []))
    for trace in snap.get("device_traces", []):
        for e in trace:
            fix(e.get("frames", []))
    pickle.dump(snap, open(dst, "wb"), protocol=4)
    json.dump(mapping, sys.stdout)


main()
