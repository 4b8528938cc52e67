"""skipsearch: find, ship and run self-speculative decoding draft profiles."""

__version__ = "0.1.0"
