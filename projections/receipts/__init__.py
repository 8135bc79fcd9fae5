"""Read-only invocation receipts: what they say, how they are read and materialized.

:func:`build_receipt` (:mod:`.builder`) is the one pure function from a record and its
journal to a receipt; :mod:`.journal` says what an event stream proves about its record
and :mod:`.agreement` whether the two still agree. :mod:`.snapshot` reads what a receipt
is built from consistently, :mod:`.inspection` answers the receipt API through the
invocation's run, and :mod:`.projection` is the worker's projection that materializes
each receipt.
"""
