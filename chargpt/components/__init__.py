"""The parts a training run is made of, each called by the loop (chargpt/training.py) with explicit arguments.

    start.py       start_run(): settings, run directory, corpus, sizing, model, optimizer, restore -> Run
    describe.py    the start-up lines, a pure function of the Run
    state.py       RunState (what changes as a run trains) and the state a --resume continues from
    progress.py    clocks, speed and the progress bar
    sinks.py       where records go: the run's .jsonl files, and any logger added beside them
    validate.py    when to evaluate and the evaluation itself
    checkpoint.py  saving a run (state, latest, best) and restoring it
    samples.py     samples while training and when it ends, with their novelty scores
    interrupt.py   the quiet start, and signals during training

Nothing here imports torch at package import: entry points import interrupt.py before torch loads.
"""
