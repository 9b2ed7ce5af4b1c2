from dse.study.cli import entry

entry()
