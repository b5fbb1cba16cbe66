"""``python -m bench``: run the benchmark suite (``--help`` for options)."""
from bench.run import main

raise SystemExit(main())
