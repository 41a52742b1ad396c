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
            /tmp/ipykernel_4242/<number>.py, and a library copied into its
            folder an installed one

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
        # A copy of a library inside the program's folder is told from the
        # program's own files by the script beside it; a notebook has no
        # script, so the copy is given as installed. torch.compile's
        # generated code keeps its cache folder.
        for lib in ("transformers", "torch", "megatron", "vllm"):
            if f"/{lib}/" in path:
                rest = path.split(f"/{lib}/", 1)[1]
                return f"/opt/conda/lib/python3.10/site-packages/{lib}/{rest}"
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
