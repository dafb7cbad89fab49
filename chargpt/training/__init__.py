"""Training: the loop (trainer.py), the parts it calls, and what sizes, schedules and optimises a run.

The parts a training run is made of, each called by the loop (chargpt/training/trainer.py) with explicit arguments.

    start.py       start_run(): settings, run directory, corpus, sizing, model, optimizer, restore -> Run
    describe.py    the start-up lines, a pure function of the Run
    state.py       RunState (what changes as a run trains) and the state a --resume continues from
    progress.py    clocks, speed and the progress bar
    sinks.py       where records go: the run's .jsonl files, status.json, and any logger added beside them
    validate.py    when to evaluate and the evaluation itself
    checkpointer.py  saving a run (state, latest, best) and restoring it
    samples.py     samples while training and when it ends, with their novelty scores
    interrupt.py   the quiet start, and signals during training
    budget.py      a time budget's warm-up share, the speed against the probe's, evaluation kept to a tenth
    trackers.py    --log-to: TensorBoard, W&B and MLflow as sinks
    overfit.py     the overfitting warning, a sink

Beside them, the loop and what shapes a run:

    flat.py        the parameters and gradients as views of one buffer
    init_from.py   --init-from: a new run from a trained one's weights
    optim.py       optimizers: AdamW, or Muon for the block matrices and AdamW for the rest
    schedules.py   learning-rate schedules and the budget
    sizing.py      --preset auto: the model for this budget, machine and corpus
    tasks.py       what a run learns: text, or sentence pairs
    trainer.py     train(): start_run, then the Trainer: only the loop

Nothing here imports torch at package import: entry points import interrupt.py before torch loads.
"""
