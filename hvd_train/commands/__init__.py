"""One module per `hvd-train` command, each with `main(argv, prog)`; cli.py is their table.
A command module imports no TensorFlow at its top: `hvd-train --help` and the launchers stay fast.
`environment.py` is no command: the one start-up of those that load TensorFlow."""
