"""hybridrank's hydra configs, installed as the package ``hybridrank.conf`` (read through
``pkg://hybridrank.conf``). Edit the YAML files; this file only makes the folder a package."""
