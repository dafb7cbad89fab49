"""python -m chargpt.bench: the benchmark command (usage in __init__.py)."""

from chargpt.bench import main

main()
