// The metadata query language (written next).
