"""RubberBand 4.4 placement controller: properties over random clusters."""

from hypothesis import given, settings, strategies as st

from thrifty.runtime.placement import place

G = 4


def nodes_of(k):
    return {f"n{i}": G for i in range(k)}


@st.composite
def cluster(draw):
    k = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), max_size=10))
    allocs, total = {}, 0
    for i, s in enumerate(sizes):  # keep the sum within the cluster: satisfiable by construction
        if total + s <= k * G:
            allocs[f"t{i}"] = s
            total += s
    return k, allocs


def check_valid(p, nodes, allocs, reserved=None):
    reserved = reserved or {}
    for n, cap in nodes.items():
        assert p.used(n) + reserved.get(n, 0) <= cap
    for t, where in p.assignment.items():
        assert sum(where.values()) == allocs[t]
        if allocs[t] <= G:
            assert len(where) == 1          # a trial smaller than a node sits on one node
        else:
            assert all(g == G for g in where.values())  # larger ones take whole nodes


@settings(max_examples=150, deadline=None)
@given(cluster())
def test_every_satisfiable_allocation_is_placed_without_oversubscription(c):
    k, allocs = c
    nodes = nodes_of(k)
    p = place(allocs, None, nodes)
    check_valid(p, nodes, allocs)
    assert p.unplaced == () and set(p.assignment) == set(allocs)


@settings(max_examples=150, deadline=None)
@given(cluster(), st.data())
def test_unchanged_trials_stay_when_others_shrink_or_leave(c, data):
    k, allocs = c
    nodes = nodes_of(k)
    first = place(allocs, None, nodes)
    new = {}
    for t, a in allocs.items():
        action = data.draw(st.sampled_from(["keep", "shrink", "drop"]))
        if action == "keep":
            new[t] = a
        elif action == "shrink" and a > 1:
            new[t] = a // 2
    p = place(new, first.assignment, nodes)
    check_valid(p, nodes, new)
    assert p.unplaced == ()
    for t in new:
        if new[t] == allocs[t]:
            assert p.assignment[t] == first.assignment[t]


@settings(max_examples=100, deadline=None)
@given(cluster(), st.integers(0, 5), st.integers(0, G))
def test_reserved_gpus_are_never_given_out(c, node, amount):
    k, allocs = c
    nodes = nodes_of(k)
    reserved = {f"n{node % k}": amount}
    p = place(allocs, None, nodes, reserved)
    check_valid(p, nodes, allocs, reserved)
    placed = sum(allocs[t] for t in p.assignment)
    assert placed <= k * G - amount


def test_displaces_smaller_trials_to_fit_a_larger_one():
    nodes = nodes_of(2)
    first = place({"a": 2, "b": 2}, {"a": {"n0": 2}, "b": {"n1": 2}}, nodes)
    assert first.assignment == {"a": {"n0": 2}, "b": {"n1": 2}}
    p = place({"a": 2, "b": 2, "c": 4}, first.assignment, nodes)
    check_valid(p, nodes, {"a": 2, "b": 2, "c": 4})
    assert p.unplaced == () and len(set(p.assignment["a"]) | set(p.assignment["b"])) == 1
