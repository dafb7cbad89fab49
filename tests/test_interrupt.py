"""Signals while training: each one says what the run is doing about it, in the words that fit what is running
(a step, an evaluation, a save), and only a third one stops without saving."""

import signal

import pytest

from chargpt.training.interrupt import Aborted, SignalFlag, StopRequested


def signals(where, n, distributed=False):
    said = []
    flag = SignalFlag(say=said.append, distributed=distributed)
    with flag.doing(where):
        for _ in range(n):
            flag._handle(signal.SIGTERM, None)
    return flag, said


def test_a_signal_during_a_step_stops_after_it_and_saves():
    flag, said = signals("step", 1)
    assert flag.requested and said == ["SIGTERM: stopping after the current step, then saving the run (a second "
                                       "signal waits for the save; a third abandons it, keeping the last complete "
                                       "save)"]


def test_a_signal_during_an_evaluation_abandons_it_unless_ranks_must_agree():
    flag, said = signals("evaluation", 1)
    assert said[0].startswith("SIGTERM: abandoning the evaluation, then saving the run as it stands")
    with pytest.raises(StopRequested):
        flag.check()
    flag, said = signals("evaluation", 1, distributed=True)
    assert said[0].startswith("SIGTERM: stopping after the current evaluation")
    flag.check()  # under torchrun the loop's agreed flags stop every rank at the same step instead


def test_a_second_signal_says_saving_only_when_a_save_is_running():
    _, said = signals("save", 2)
    assert said[1].startswith("SIGTERM: saving, please wait")
    _, said = signals("step", 2)
    assert said[1].startswith("SIGTERM: already stopping; the run saves after the current step")


def test_a_third_signal_aborts_and_names_what_it_cut_short():
    for where in ("save", "step"):
        with pytest.raises(Aborted) as e:
            signals(where, 3)
        assert e.value.during == where and e.value.signum == signal.SIGTERM


def test_doing_restores_what_ran_before():
    flag = SignalFlag()
    with flag.doing("evaluation"):
        with flag.doing("save"):
            assert flag.where == "save"
        assert flag.where == "evaluation"
    assert flag.where == "step"
