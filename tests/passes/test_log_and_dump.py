"""Log topics from TILEFUSE_LOG, and the dump directory and writer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tilefuse.dump import DumpWriter, resolve_dump_dir
from tilefuse.errors import TilefuseError
from tilefuse.log import TOPICS, configure_from_env, get_logger


@pytest.fixture
def clean_loggers() -> Iterator[None]:
    """Undoes what configure_from_env does to the process-wide logging tree."""
    root = logging.getLogger("tilefuse")
    handlers = list(root.handlers)
    levels = {t: get_logger(t).level for t in TOPICS}
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    for t, level in levels.items():
        get_logger(t).setLevel(level)


def _our_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger("tilefuse").handlers
            if type(h).__name__ == "_EnvHandler"]


def test_topics_are_loggers_under_tilefuse():
    assert TOPICS == ("guards", "recompiles", "passes", "fusion", "cache", "tune", "fallback",
                      "graph_breaks", "distributed")
    assert get_logger("guards").name == "tilefuse.guards"
    with pytest.raises(TilefuseError, match="unknown log topic 'gaurds'"):
        get_logger("gaurds")


def test_env_enables_topics_once(clean_loggers):
    enabled = configure_from_env({"TILEFUSE_LOG": "guards, Recompiles,passes"})
    assert enabled == {"guards", "recompiles", "passes"}
    assert get_logger("passes").getEffectiveLevel() == logging.DEBUG
    configure_from_env({"TILEFUSE_LOG": "guards,recompiles,passes"})
    assert len(_our_handlers()) == 1


def test_all_enables_every_topic(clean_loggers):
    assert configure_from_env({"TILEFUSE_LOG": "all"}) == set(TOPICS)
    assert all(get_logger(t).level == logging.DEBUG for t in TOPICS)


def test_no_env_adds_no_handler(clean_loggers):
    assert configure_from_env({}) == frozenset()
    assert _our_handlers() == []


def test_unknown_topics_produce_one_warning(clean_loggers, caplog):
    with caplog.at_level(logging.WARNING, logger="tilefuse"):
        enabled = configure_from_env({"TILEFUSE_LOG": "passes,bogus,nope"})
    assert enabled == {"passes"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "bogus, nope" in message and "guards" in message and "fallback" in message


def test_enabled_topic_reaches_stderr(clean_loggers, capsys):
    configure_from_env({"TILEFUSE_LOG": "cache"})
    # the handler holds the stream that was sys.stderr when it was made (pytest's capture)
    get_logger("cache").debug("hit %s", "abc")
    assert "tilefuse.cache: hit abc" in capsys.readouterr().err


def test_resolve_dump_dir(tmp_path):
    env = {"TILEFUSE_DUMP": str(tmp_path / "env")}
    assert resolve_dump_dir(tmp_path / "explicit", env) == tmp_path / "explicit"
    assert resolve_dump_dir(str(tmp_path), env) == tmp_path
    assert resolve_dump_dir(None, env) == tmp_path / "env"
    assert resolve_dump_dir(None, {"TILEFUSE_DUMP": ""}) is None
    assert resolve_dump_dir(None, {}) is None


def test_resolve_dump_dir_reads_the_process_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_DUMP", str(tmp_path))
    assert resolve_dump_dir(None) == tmp_path
    monkeypatch.delenv("TILEFUSE_DUMP")
    assert resolve_dump_dir(None) is None


def test_writer_creates_directories(tmp_path):
    writer = DumpWriter(tmp_path / "a" / "b")
    path = writer.write("kernels/k0.ll", "define void @k0()\n")
    assert path == tmp_path / "a" / "b" / "kernels" / "k0.ll"
    assert path.read_text() == "define void @k0()\n"
    writer.write("00-captured.graph", "x")
    assert (tmp_path / "a" / "b" / "00-captured.graph").read_text() == "x"


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "", ".", "kernels/.."])
def test_writer_rejects_names_outside_its_directory(tmp_path, name):
    with pytest.raises(TilefuseError, match="dump file name"):
        DumpWriter(tmp_path / "d").write(name, "x")
    assert not (tmp_path / "x").exists()


def test_writer_rejects_links_that_leave_the_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "outside").mkdir()
    Path(tmp_path / "d" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(TilefuseError, match="escapes"):
        DumpWriter(tmp_path / "d").write("link/x.graph", "x")
    assert not (tmp_path / "outside" / "x.graph").exists()


def test_write_failures_are_tilefuse_errors(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(TilefuseError, match="cannot write dump file"):
        DumpWriter(tmp_path / "file").write("x.graph", "x")
