"""Capture: the user's model as an fx graph with a shape and dtype on every node
(:mod:`.capture`), the memo of captures (:mod:`.memo`), how a call's inputs are laid out
(:mod:`.inputs`) and the standard ``nn`` layers kept whole as leaves
(:mod:`.standard_layers`)."""
