"""``python -m distill`` (and ``accelerate launch -m distill``) runs the CLI."""

from distill.cli import main

raise SystemExit(main())
