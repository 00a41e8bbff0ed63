"""Video inputs: decoded frames on a stream's or a file's timeline, and the consumers that read them."""
