"""The algorithm contract and its building blocks, one concern a module (as optax's ``_src``).

:mod:`~fedco.algorithms.core.types` holds :class:`Algorithm`, :class:`CommPlan` and
:func:`make_plan`; :mod:`~fedco.algorithms.core.registry` the :func:`factory` and
:func:`register` decorators and the registry behind ``fedco.ALGORITHMS``;
:mod:`~fedco.algorithms.core.trackers` the :class:`Pending` trackers of the inner value;
:mod:`~fedco.algorithms.core.fields` :func:`get_field` and :func:`set_fields`;
:mod:`~fedco.algorithms.core.composition` :func:`chain`, :func:`named_chain` and
:func:`inject_hyperparams`; :mod:`~fedco.algorithms.core.servers` the servers
(:class:`ServerAggregator`, :class:`RoundInfo`, :func:`averaging_server`, ...); and
:mod:`~fedco.algorithms.core.steps` the helpers inside ``update`` (:func:`param_optimizer`,
:func:`oracles`, :func:`select`, ...). Users import these from :mod:`fedco.extend` and
:mod:`fedco.algorithms`; this package has no names of its own.
"""
