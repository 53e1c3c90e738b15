"""The user errors hvd_train reports in one line with exit code 2."""


class UserError(Exception):
    """A problem the user can fix (bad config, bad input): one line, exit code 2, no traceback."""


class ConfigError(UserError):
    """The config file or a `--set` override is invalid."""


class DataError(UserError):
    """The training or validation data cannot be used as configured."""
