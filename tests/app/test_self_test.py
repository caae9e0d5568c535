"""`ponder --self-test`: one line per check with ok/FAIL and its time, exit code 1 when any check fails."""
import io

from app import self_test
from app.main import main


def test_report_lists_every_check_and_fails_on_any_failure():
    def boom():
        raise RuntimeError("kernel missing")

    results = self_test.run_checks((("fine", lambda: "all good"), ("broken", boom)))
    out = io.StringIO()
    assert self_test.report(results, out) == 1
    lines = out.getvalue().splitlines()
    assert lines[1].split()[:2] == ["ok", "fine"] and lines[1].endswith("all good")
    assert lines[2].split()[:2] == ["FAIL", "broken"] and "RuntimeError: kernel missing" in lines[2]
    assert lines[-1].startswith("FAILED: broken")
    assert all("s " in line for line in lines[1:3])  # a timing on each check line


def test_all_passing_exits_zero(capsys, monkeypatch):
    monkeypatch.setattr(self_test, "CHECKS", (("one", lambda: "x"), ("two", lambda: "y")))
    assert main(["--self-test"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("all checks passed")


def test_real_light_checks_pass(qapp):
    """The cheap real checks (the heavy ones run in `ponder --self-test` and in the frozen-build proof)."""
    for check in (self_test.check_qt, self_test.check_resources, self_test.check_scorer, self_test.check_database):
        assert check()
