"""The floor: errors with their exit codes, each rank's log, start-up marks, atomic files.
Standard library only; every other layer imports from here."""
