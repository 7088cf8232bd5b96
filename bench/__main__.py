"""python -m bench: see bench/cli.py."""

from bench.cli import main

if __name__ == "__main__":
    main()
