"""python -m chargpt.bench: the benchmark command (usage in __init__.py)."""

from . import main

main()
