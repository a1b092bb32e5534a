"""Rules of the legalize step (``importable/legalize.py``), one module per rule.

Each is an onnxscript rewrite rule about one op (``base.NodeRule``): its check reads the node's
inputs on the IR (constants, inferred static shapes and types) and fails with the reason it does
not apply; its rewrite builds the replacement with the rewriter's op builder.
"""
