"""The etmlx payload: schema, generated code, header, writer and validating reader."""

from .constants import BACKEND_ID, FORMAT_VERSION
from .errors import PayloadError
from .ir import node_type
from .payload import deserialize, serialize

__all__ = ["BACKEND_ID", "FORMAT_VERSION", "PayloadError", "deserialize", "node_type", "serialize"]
