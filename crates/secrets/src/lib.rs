//! The secrets context: named secrets per Domain, read by that Domain's Nodes.
