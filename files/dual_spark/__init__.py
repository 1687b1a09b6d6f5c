"""The programs the deploy runs on the nodes, shipped as one zipapp (programs.py builds it):
Python 3.10+, standard library only (fetch, which runs in the runtime image, also uses its
huggingface_hub). Their constants module is written from layout.py when the archive is built."""
