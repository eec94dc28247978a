"""The errors protocol/ raises: one family, so callers catch a single type."""


class DecodeError(ValueError):
    """Bytes that are not a valid Kafka message, frame or record batch."""


class UnsupportedVersionError(DecodeError):
    """An API version this library has no codec for."""


class EncodeError(ValueError):
    """A message whose field values cannot be written in the requested version."""
