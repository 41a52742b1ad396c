"""The CPU recorder's compiled library: only ever this user's own build is
loaded, a broken cache is built again, and ranks without a writable cache
build it once a host and leave no folder behind. Each case runs in a fresh
Python process, as a job would, with the real compiler and torch."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

# Run in a fresh process: which recorder it got, and whether the planted
# library ran (its constructor writes the marker file).
PROBE = textwrap.dedent(
    """
    import json, os
    from snapdiff.hook import snapdiff_cpu_recorder as r
    recorder = r.CpuRecorder(warn=lambda m: print("warned:", m))
    print(json.dumps({
        "recorder": type(recorder).__name__,
        "planted_ran": os.path.exists(os.environ["PLANTED_MARKER"]),
    }))
    """
)


def library_name():
    from snapdiff.hook import snapdiff_cpu_recorder as r

    return f"cpu_alloc-{r._build_key()}.so"


@pytest.fixture
def planted(tmp_path):
    """A compiled library whose loading leaves a marker file."""
    source = tmp_path / "planted.cpp"
    source.write_text(
        '#include <cstdio>\n#include <cstdlib>\n'
        'extern "C" __attribute__((constructor)) void planted() {\n'
        '  if (const char* m = std::getenv("PLANTED_MARKER")) std::fclose(std::fopen(m, "w"));\n'
        "}\n"
    )
    library = tmp_path / "planted.so"
    subprocess.run(
        [os.environ.get("CXX", "g++"), "-shared", "-fPIC", str(source), "-o", str(library)],
        check=True,
    )
    return library


def probe(tmp_path, cache, extra_env=None):
    """Starts a recorder in a new process whose cache is `cache` and whose
    temporary folder is `tmp_path/tmp`; returns what it says."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        XDG_CACHE_HOME=str(cache),
        TMPDIR=str(temp),
        PLANTED_MARKER=str(tmp_path / "planted-ran"),
        **(extra_env or {}),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def plant_in_shared_folder(cache, planted):
    """The cache folder is one others can write, with their library in it."""
    folder = cache / "snapdiff"
    folder.mkdir(parents=True)
    shutil.copy(planted, folder / library_name())
    folder.chmod(0o777)


def plant_folder_link(cache, planted):
    """The cache folder is a link to another folder holding their library."""
    theirs = cache.parent / "theirs"
    theirs.mkdir()
    shutil.copy(planted, theirs / library_name())
    cache.mkdir()
    (cache / "snapdiff").symlink_to(theirs)


def plant_library_link(cache, planted):
    """The cached library is a link to theirs."""
    folder = cache / "snapdiff"
    folder.mkdir(parents=True, mode=0o700)
    (folder / library_name()).symlink_to(planted)


def plant_writable_library(cache, planted):
    """The cached library is a file others can write (and did)."""
    folder = cache / "snapdiff"
    folder.mkdir(parents=True, mode=0o700)
    shutil.copy(planted, folder / library_name())
    (folder / library_name()).chmod(0o666)


@pytest.mark.parametrize(
    "plant",
    [plant_in_shared_folder, plant_folder_link, plant_library_link, plant_writable_library],
)
def test_a_library_planted_in_the_cache_is_never_loaded(tmp_path, planted, plant):
    cache = tmp_path / "cache"
    plant(cache, planted)
    said = probe(tmp_path, cache)
    assert said == {"recorder": "AllocatorRecorder", "planted_ran": False}
    # And a second start, with the cache as the first left it, neither.
    assert probe(tmp_path, cache) == said


def test_a_cached_library_that_does_not_load_is_built_again(tmp_path):
    cache = tmp_path / "cache"
    folder = cache / "snapdiff"
    folder.mkdir(parents=True, mode=0o700)
    for broken in (b"", b"\x7fELF cut short"):
        (folder / library_name()).write_bytes(broken)
        (folder / library_name()).chmod(0o700)
        assert probe(tmp_path, cache)["recorder"] == "AllocatorRecorder"
        assert (folder / library_name()).stat().st_size > 1000


def test_without_a_writable_cache_ranks_build_once_a_host_and_leave_no_folder(tmp_path):
    # The cache's place is a file: no cache folder can be made there.
    cache = tmp_path / "not-a-folder"
    cache.write_text("")
    # The compiler, counted: each run appends a line, then compiles.
    calls = tmp_path / "compiles"
    counting = tmp_path / "counting-cxx"
    counting.write_text(
        f'#!/bin/sh\necho "$$" >> "{calls}"\nexec {os.environ.get("CXX", "g++")} "$@"\n'
    )
    counting.chmod(0o755)
    env = {"CXX": str(counting)}
    temp = tmp_path / "tmp"
    temp.mkdir()
    # Four ranks start at once.
    script = [sys.executable, "-c", PROBE]
    full_env = dict(
        os.environ,
        XDG_CACHE_HOME=str(cache),
        TMPDIR=str(temp),
        PLANTED_MARKER=str(tmp_path / "planted-ran"),
        **env,
    )
    ranks = [
        subprocess.Popen(script, env=full_env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for rank in ranks:
        out, _ = rank.communicate(timeout=300)
        assert rank.returncode == 0
        assert json.loads(out.splitlines()[-1])["recorder"] == "AllocatorRecorder"
    assert len(calls.read_text().splitlines()) == 1
    assert sorted(os.listdir(temp)) == [f"snapdiff-cache-{os.getuid()}"]
    # A fifth start later compiles nothing.
    assert probe(tmp_path, cache, env)["recorder"] == "AllocatorRecorder"
    assert len(calls.read_text().splitlines()) == 1


def test_with_no_private_folder_the_library_is_built_apart_and_removed(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder another user owns")
    cache = tmp_path / "not-a-folder"
    cache.write_text("")
    temp = tmp_path / "tmp"
    temp.mkdir()
    # Another user took the temporary folder's name first.
    taken = temp / f"snapdiff-cache-{os.getuid()}"
    taken.mkdir()
    os.chown(taken, 65534, 65534)
    assert probe(tmp_path, cache)["recorder"] == "AllocatorRecorder"
    assert os.listdir(temp) == [taken.name]
    assert os.listdir(taken) == []
