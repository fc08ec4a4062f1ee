"""Errors that name the problem, so bad input never ends in a bare traceback."""


class TwinrunError(ValueError):
    """Base class for every user-facing error in twinrun."""


class DataError(TwinrunError):
    """A data set is missing, corrupt, or asked for in a way that cannot work."""


class ConfigError(TwinrunError):
    """A run configuration names an unknown option or an impossible combination."""


class UnknownFamily(ConfigError):
    """A description whose family no model builder of a framework is registered for."""
