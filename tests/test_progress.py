import io

from lorapop.progress import progress


def test_lines_mode_prints_done_of_total_rate_and_time_left():
    out = io.StringIO()
    with progress("solve", total=8, unit="rows", mode="lines", interval_s=0.0, stream=out) as p:
        for _ in range(4):
            p.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("solve: 2/8 rows (") and "left" in lines[0]
    assert lines[-1].startswith("solve: 8/8 rows (") and "left" not in lines[-1]
    assert "rows/s" in lines[-1]
    assert len(lines) == len(set(lines)) == 4  # one line per update, the last not printed twice on close


def test_lines_mode_is_rate_limited_and_off_is_silent():
    out = io.StringIO()
    with progress("x", total=1000, mode="lines", interval_s=3600, stream=out) as p:
        for _ in range(1000):
            p.advance()
    assert out.getvalue() == ""  # a stage shorter than the interval says nothing
    with progress("x", total=3, mode="off", interval_s=0, stream=out) as p:
        p.advance(3)
    assert out.getvalue() == ""


def test_auto_mode_uses_lines_off_a_terminal(monkeypatch):
    monkeypatch.delenv("LORAPOP_PROGRESS", raising=False)
    assert progress("x", 1, stream=io.StringIO()).mode == "lines"
    monkeypatch.setenv("LORAPOP_PROGRESS", "off")
    assert progress("x", 1, stream=io.StringIO()).mode == "off"


def test_bar_mode_draws_with_rich_and_a_second_bar_falls_back_to_lines():
    out, inner_out = io.StringIO(), io.StringIO()
    with progress("update", total=4, unit="rows", mode="bar", stream=out) as p:
        with progress("inner", total=2, mode="bar", stream=inner_out) as inner:
            assert inner.mode == "lines"
        p.advance(4)
    assert "update" in out.getvalue()
    assert progress("again", total=1, mode="bar", stream=io.StringIO()).mode == "bar"


def test_a_host_display_receives_bars_instead_of_a_second_live_display():
    from lorapop import progress as mod

    seen = []
    mod.set_host(lambda bar: seen.append(None if bar is None else bar.line()))
    try:
        with progress("generate", total=10, unit="tok", mode="bar", stream=io.StringIO()) as p:
            assert p.mode == "host"
            p.advance(5)
        assert seen[0].startswith("generate: 5/10 tok") and seen[-1] is None
    finally:
        mod.set_host(None)


def test_trainer_table_shows_the_work_in_flight():
    from lorapop.train.logger import Progress as StepTable

    out = io.StringIO()
    table = StepTable("rich", total_steps=3, stream=out)
    try:
        table.begin_stage(1, "solve")
        with progress("generate", total=8, unit="rows", mode="bar", stream=io.StringIO()) as p:
            p.advance(3)
            assert "generate: 3/8 rows" in table.work.line()
    finally:
        table.close()
    assert table.work is None and "solve" in out.getvalue()
