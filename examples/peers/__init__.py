"""Model definitions from other libraries, built as their users build them, for the peer
suite (``tests/test_peers.py``): autopar must split them as it splits its own models."""
