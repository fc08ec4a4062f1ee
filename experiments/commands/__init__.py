"""One module per ``twinrun`` command: argparse and console output only (imported by ``experiments.__main__``)."""
