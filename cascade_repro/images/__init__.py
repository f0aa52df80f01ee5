"""Docker: the image a run executes in. Build context and inputs hash (`context`), the engine through
the Docker SDK (`engine`: connect, build or reuse, probe), and the child run in a container
(`container`). Only `engine` and `container` import `docker`, and only inside functions.
"""
