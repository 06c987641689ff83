"""Progress in a log (stderr not a terminal, as under pytest): no bar, one line per reported step."""

from structures.experiments.progress import Progress, report


def test_a_log_gets_one_line_per_step_and_no_bar(capsys):
    bar = Progress(range(3), desc="train")
    for epoch in bar:
        report(bar, epoch, loss=f"{1.0 / (epoch + 1):.2f}")
    out, err = capsys.readouterr()
    assert out.splitlines() == ["train 0: loss 1.00", "train 1: loss 0.50", "train 2: loss 0.33"]
    assert err == ""
