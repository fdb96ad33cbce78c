"""The one exception type the data layer raises for user-fixable problems."""


class DataError(ValueError):
    """A data setting is wrong or the data on disk is unusable.

    The message is one line naming the setting (e.g. ``data.root``) and how to fix it, so the
    CLI can print it as is instead of a traceback.
    """
