from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from nsqtw.storage import durable
