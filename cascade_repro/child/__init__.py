"""The child half of `cascade run`: standard library only (plus what the script itself imports).

Nothing under this package may import mlflow, dvc, git or docker: it runs inside the training
process, possibly in a container where only torch is installed.
"""
