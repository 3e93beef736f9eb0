"""The parts of ``bench/supernet.py``, one job a module; the script keeps its argument parsing and ``main()``.

Its modules are imported as ``supernet_bench.<module>``: ``python bench/supernet.py`` puts ``bench/`` on
``sys.path``."""
