"""The model-control journal a restarted scheduler replays (scheduler/repository/journal.py)."""

from scheduler.repository.journal import FILE_NAME, Journal, read_files


def test_latest_call_per_model_in_call_order(tmp_path):
    """Rule: one entry per model, its latest call, ordered by when that call came; a
    new Journal over the same directory reads the same entries back."""
    j = Journal(str(tmp_path))
    j.loaded("a", '{"name": "a"}', None)
    j.loaded("b", None, "/x/b")
    j.unloaded("a", unload_dependents=True)
    again = Journal(str(tmp_path))
    assert [(e.name, e.op, e.config, e.files_dir, e.unload_dependents)
            for e in again.replay_order()] == [("b", "load", None, "/x/b", False),
                                               ("a", "unload", None, None, True)]


def test_without_a_state_dir_nothing_is_kept(tmp_path):
    """Rule: a scheduler run without the root keeps no journal and writes nothing."""
    j = Journal("")
    j.loaded("a", None, None)
    assert not j.enabled
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_journal_is_ignored(tmp_path):
    """Rule: a corrupt journal is logged and ignored, never a crash at restart."""
    (tmp_path / FILE_NAME).write_text("[{not json")
    assert Journal(str(tmp_path)).replay_order() == []


def test_read_files_gives_the_loads_file_parameters(tmp_path):
    """Rule: a model directory comes back as the `file:<path>` parameters that made it."""
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_bytes(b"code")
    (tmp_path / "config.pbtxt").write_bytes(b"cfg")
    assert read_files(str(tmp_path)) == {"file:1/model.py": b"code",
                                         "file:config.pbtxt": b"cfg"}
