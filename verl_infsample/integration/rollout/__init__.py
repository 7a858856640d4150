"""verl's side of the plugin: the ``infinite`` rollout backend (server, replica, worker adapter, router).

Imported only where verl runs; ``verl_infsample.register()`` puts the names into verl's registries lazily.
"""
