"""Equality-saturation rules, one case each: the rule fires on the "before" graph, the pass
(followed by constant folding and DCE, as in the pipeline) gives exactly the "after" graph, and
both compute the same results on random inputs."""

# ruff: noqa: E501 (golden graph texts hold constants on one line)

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tilefuse.graph.interpreter import interpret
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.passes.constant_fold import constant_fold
from tilefuse.passes.dce import dce
from tilefuse.passes.eqsat.saturate import rule_names, saturate
from tilefuse.testing import assert_close, random_array

CASES: dict[str, tuple[str, str]] = {}
CASES.update({
    "transpose_into_binary_constant_right": (
        """
        graph @g(%x: f32[2,3,4]) -> f32[2,3,4] {
          %0 = transpose(%x) {perm=[0,2,1]} : f32[2,4,3]
          %1 = constant() {value=array<f32[4,1]>[[1.0],[2.0],[3.0],[4.0]]} : f32[4,1]
          %2 = mul(%0, %1) : f32[2,4,3]
          %3 = transpose(%2) {perm=[0,2,1]} : f32[2,3,4]
          return %3
        }
        """,
        """
        graph @g(%x: f32[2,3,4]) -> f32[2,3,4] {
          %0 = constant() {value=array<f32[1,1,4]>[[[1.0,2.0,3.0,4.0]]]} : f32[1,1,4]
          %1 = mul(%x, %0) : f32[2,3,4]
          return %1
        }
        """),
    "transpose_into_binary_constant_left": (
        """
        graph @g(%x: f32[2,3,4]) -> f32[2,3,4] {
          %0 = transpose(%x) {perm=[0,2,1]} : f32[2,4,3]
          %1 = constant() {value=array<f32[4,1]>[[1.0],[2.0],[3.0],[4.0]]} : f32[4,1]
          %2 = sub(%1, %0) : f32[2,4,3]
          %3 = transpose(%2) {perm=[0,2,1]} : f32[2,3,4]
          return %3
        }
        """,
        """
        graph @g(%x: f32[2,3,4]) -> f32[2,3,4] {
          %0 = constant() {value=array<f32[1,1,4]>[[[1.0,2.0,3.0,4.0]]]} : f32[1,1,4]
          %1 = sub(%0, %x) : f32[2,3,4]
          return %1
        }
        """),
    "mul_one": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>1.0} : f32[]
          %1 = mul(%x, %0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "one_mul": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[3]>[1.0,1.0,1.0]} : f32[3]
          %1 = mul(%0, %x) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "div_one": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>1.0} : f32[]
          %1 = div(%x, %0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "add_zero": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>0.0} : f32[]
          %1 = add(%x, %0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "zero_add": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>0.0} : f32[]
          %1 = add(%0, %x) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "sub_zero": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>0.0} : f32[]
          %1 = sub(%x, %0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "neg_neg": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = neg(%x) : f32[2,3]
          %1 = neg(%0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "transpose_transpose": (
        """
        graph @g(%x: f32[2,3,4]) -> f32[4,2,3] {
          %0 = transpose(%x) {perm=[1,0,2]} : f32[3,2,4]
          %1 = transpose(%0) {perm=[2,1,0]} : f32[4,2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3,4]) -> f32[4,2,3] {
          %0 = transpose(%x) {perm=[2,0,1]} : f32[4,2,3]
          return %0
        }
        """),
    "transpose_identity": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = transpose(%0) {perm=[1,0]} : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "reshape_reshape": (
        """
        graph @g(%x: f32[2,3,4]) -> f32[4,6] {
          %0 = reshape(%x) {shape=[6,4]} : f32[6,4]
          %1 = reshape(%0) {shape=[4,6]} : f32[4,6]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3,4]) -> f32[4,6] {
          %0 = reshape(%x) {shape=[4,6]} : f32[4,6]
          return %0
        }
        """),
    "reshape_identity": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = expand_dims(%x) {axes=[0]} : f32[1,2,3]
          %1 = squeeze(%0) {axes=[0]} : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "cast_cast_exact": (
        """
        graph @g(%x: f16[2,3]) -> f64[2,3] {
          %0 = cast(%x) {dtype=f32} : f32[2,3]
          %1 = cast(%0) {dtype=f64} : f64[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f16[2,3]) -> f64[2,3] {
          %0 = cast(%x) {dtype=f64} : f64[2,3]
          return %0
        }
        """),
    "cast_identity": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = cast(%x) {dtype=f64} : f64[2,3]
          %1 = cast(%0) {dtype=f32} : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          return %x
        }
        """),
    "broadcast_identity": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = broadcast_to(%x) {shape=[2,3]} : f32[2,3]
          %1 = exp(%0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = exp(%x) : f32[2,3]
          return %0
        }
        """),
    "broadcast_broadcast": (
        """
        graph @g(%x: f32[3]) -> f32[4,2,3] {
          %0 = broadcast_to(%x) {shape=[2,3]} : f32[2,3]
          %1 = broadcast_to(%0) {shape=[4,2,3]} : f32[4,2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[3]) -> f32[4,2,3] {
          %0 = broadcast_to(%x) {shape=[4,2,3]} : f32[4,2,3]
          return %0
        }
        """),
    "binary_broadcast_right": (
        """
        graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {
          %0 = broadcast_to(%b) {shape=[2,3]} : f32[2,3]
          %1 = add(%x, %0) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {
          %0 = add(%x, %b) : f32[2,3]
          return %0
        }
        """),
    "binary_broadcast_left": (
        """
        graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {
          %0 = broadcast_to(%b) {shape=[2,3]} : f32[2,3]
          %1 = sub(%0, %x) : f32[2,3]
          return %1
        }
        """,
        """
        graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {
          %0 = sub(%b, %x) : f32[2,3]
          return %0
        }
        """),
    "reshape_out_of_unary": (   # torch's view -> gelu -> view between two linear layers
        """
        graph @g(%x: f32[6,4]) -> f32[6,4] {
          %0 = reshape(%x) {shape=[1,6,4]} : f32[1,6,4]
          %1 = gelu(%0) {approximate="none"} : f32[1,6,4]
          %2 = reshape(%1) {shape=[6,4]} : f32[6,4]
          return %2
        }
        """,
        """
        graph @g(%x: f32[6,4]) -> f32[6,4] {
          %0 = gelu(%x) {approximate="none"} : f32[6,4]
          return %0
        }
        """),
    "transpose_into_unary": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = exp(%0) : f32[3,2]
          %2 = transpose(%1) {perm=[1,0]} : f32[2,3]
          return %2
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = exp(%x) : f32[2,3]
          return %0
        }
        """),
    "transpose_into_cast": (
        """
        graph @g(%x: f32[2,3]) -> f64[2,3] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = cast(%0) {dtype=f64} : f64[3,2]
          %2 = transpose(%1) {perm=[1,0]} : f64[2,3]
          return %2
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f64[2,3] {
          %0 = cast(%x) {dtype=f64} : f64[2,3]
          return %0
        }
        """),
    "transpose_into_binary": (
        """
        graph @g(%x: f32[2,3], %y: f32[3,2]) -> f32[3,2] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = add(%0, %y) : f32[3,2]
          %2 = transpose(%1) {perm=[1,0]} : f32[2,3]
          %3 = relu(%2) : f32[2,3]
          %4 = transpose(%3) {perm=[1,0]} : f32[3,2]
          return %4
        }
        """,
        """
        graph @g(%x: f32[2,3], %y: f32[3,2]) -> f32[3,2] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = add(%0, %y) : f32[3,2]
          %2 = relu(%1) : f32[3,2]
          return %2
        }
        """),
    "transpose_into_binary_scalar_right": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = constant() {value=array<f32[]>0.5} : f32[]
          %2 = mul(%0, %1) : f32[3,2]
          %3 = transpose(%2) {perm=[1,0]} : f32[2,3]
          return %3
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>0.5} : f32[]
          %1 = mul(%x, %0) : f32[2,3]
          return %1
        }
        """),
    "transpose_into_binary_scalar_left": (
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = constant() {value=array<f32[]>0.5} : f32[]
          %2 = sub(%1, %0) : f32[3,2]
          %3 = transpose(%2) {perm=[1,0]} : f32[2,3]
          return %3
        }
        """,
        """
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>0.5} : f32[]
          %1 = sub(%0, %x) : f32[2,3]
          return %1
        }
        """),
    "transpose_out_of_binary": (
        """
        graph @g(%x: f32[2,3], %y: f32[2,3]) -> f32[3,2] {
          %0 = transpose(%x) {perm=[1,0]} : f32[3,2]
          %1 = transpose(%y) {perm=[1,0]} : f32[3,2]
          %2 = mul(%0, %1) : f32[3,2]
          return %2
        }
        """,
        """
        graph @g(%x: f32[2,3], %y: f32[2,3]) -> f32[3,2] {
          %0 = mul(%x, %y) : f32[2,3]
          %1 = transpose(%0) {perm=[1,0]} : f32[3,2]
          return %1
        }
        """),
    "transpose_into_matmul": (
        """
        graph @g(%y: f32[3,5]) -> f32[2,5] {
          %0 = constant() {value=array<f32[3,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0]]} : f32[3,2]
          %1 = transpose(%y) {perm=[1,0]} : f32[5,3]
          %2 = matmul(%1, %0) : f32[5,2]
          %3 = transpose(%2) {perm=[1,0]} : f32[2,5]
          return %3
        }
        """,
        """
        graph @g(%y: f32[3,5]) -> f32[2,5] {
          %0 = constant() {value=array<f32[2,3]>[[1.0,0.5,0.25],[2.0,-1.0,3.0]]} : f32[2,3]
          %1 = matmul(%0, %y) : f32[2,5]
          return %1
        }
        """),
    "transpose_out_of_matmul": (
        """
        graph @g(%a: f32[9,2], %b: f32[2,9]) -> f32[2,2] {
          %0 = transpose(%a) {perm=[1,0]} : f32[2,9]
          %1 = transpose(%b) {perm=[1,0]} : f32[9,2]
          %2 = matmul(%0, %1) : f32[2,2]
          return %2
        }
        """,
        """
        graph @g(%a: f32[9,2], %b: f32[2,9]) -> f32[2,2] {
          %0 = matmul(%b, %a) : f32[2,2]
          %1 = transpose(%0) {perm=[1,0]} : f32[2,2]
          return %1
        }
        """),
    "scale_into_matmul": (
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          %2 = constant() {value=array<f32[]>0.125} : f32[]
          %3 = mul(%1, %2) : f32[5,2]
          return %3
        }
        """,
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[0.125,0.25],[0.0625,-0.125],[0.03125,0.375]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          return %1
        }
        """),
    "scale_into_matmul_left": (
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          %2 = constant() {value=array<f32[]>0.125} : f32[]
          %3 = mul(%2, %1) : f32[5,2]
          return %3
        }
        """,
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[0.125,0.25],[0.0625,-0.125],[0.03125,0.375]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          return %1
        }
        """),
    "divide_into_matmul": (
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          %2 = constant() {value=array<f32[]>8.0} : f32[]
          %3 = div(%1, %2) : f32[5,2]
          return %3
        }
        """,
        """
        graph @g(%x: f32[5,3]) -> f32[5,2] {
          %0 = constant() {value=array<f32[3,2]>[[0.125,0.25],[0.0625,-0.125],[0.03125,0.375]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[5,2]
          return %1
        }
        """),
    "reassociate_constant_matmuls": (
        """
        graph @g(%x: f32[7,2]) -> f32[7,1] {
          %0 = constant() {value=array<f32[2,3]>[[1.0,2.0,0.5],[-1.0,0.25,3.0]]} : f32[2,3]
          %1 = matmul(%x, %0) : f32[7,3]
          %2 = constant() {value=array<f32[3,1]>[[0.5],[1.5],[-2.0]]} : f32[3,1]
          %3 = matmul(%1, %2) : f32[7,1]
          return %3
        }
        """,
        """
        graph @g(%x: f32[7,2]) -> f32[7,1] {
          %0 = constant() {value=array<f32[2,1]>[[2.5],[-6.125]]} : f32[2,1]
          %1 = matmul(%x, %0) : f32[7,1]
          return %1
        }
        """),
    "merge_parallel_matmuls": (
        """
        graph @g(%x: f32[3,7]) -> (f32[3,2], f32[3,2], f32[3,1]) {
          %0 = constant() {value=array<f32[7,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0],[1.0,2.0],[0.5,-1.0],[0.25,3.0],[-1.0,-2.0]]} : f32[7,2]
          %1 = constant() {value=array<f32[7,2]>[[2.0,1.0],[-0.5,1.0],[0.75,-3.0],[1.5,0.0],[0.5,-1.5],[0.25,3.5],[-1.0,2.0]]} : f32[7,2]
          %2 = constant() {value=array<f32[7,1]>[[1.0],[2.0],[3.0],[4.0],[5.0],[6.0],[7.0]]} : f32[7,1]
          %3 = matmul(%x, %0) : f32[3,2]
          %4 = matmul(%x, %1) : f32[3,2]
          %5 = matmul(%x, %2) : f32[3,1]
          return %3, %4, %5
        }
        """,
        """
        graph @g(%x: f32[3,7]) -> (f32[3,2], f32[3,2], f32[3,1]) {
          %0 = constant() {value=array<f32[7,5]>[[1.0,2.0,2.0,1.0,1.0],[0.5,-1.0,-0.5,1.0,2.0],[0.25,3.0,0.75,-3.0,3.0],[1.0,2.0,1.5,0.0,4.0],[0.5,-1.0,0.5,-1.5,5.0],[0.25,3.0,0.25,3.5,6.0],[-1.0,-2.0,-1.0,2.0,7.0]]} : f32[7,5]
          %1 = matmul(%x, %0) : f32[3,5]
          %2 = slice(%1) {starts=[0,0], steps=[1,1], stops=[4611686018427387904,2]} : f32[3,2]
          %3 = slice(%1) {starts=[0,2], steps=[1,1], stops=[4611686018427387904,4]} : f32[3,2]
          %4 = slice(%1) {starts=[0,4], steps=[1,1], stops=[4611686018427387904,5]} : f32[3,1]
          return %2, %3, %4
        }
        """),
    "merge_sliced_bias_adds": (
        """
        graph @g(%x: f32[2,9]) -> (f32[2,2], f32[2,2]) {
          %0 = constant() {value=array<f32[9,2]>[[1.0,2.0],[0.5,-1.0],[0.25,3.0],[1.0,2.0],[0.5,-1.0],[0.25,3.0],[-1.0,-2.0],[1.0,0.5],[2.0,-0.25]]} : f32[9,2]
          %1 = constant() {value=array<f32[9,2]>[[2.0,1.0],[-0.5,1.0],[0.75,-3.0],[1.5,0.0],[0.5,-1.5],[0.25,3.5],[-1.0,2.0],[0.5,0.5],[-2.0,1.0]]} : f32[9,2]
          %2 = constant() {value=array<f32[2]>[0.5,-0.5]} : f32[2]
          %3 = constant() {value=array<f32[2]>[1.5,2.5]} : f32[2]
          %4 = matmul(%x, %0) : f32[2,2]
          %5 = add(%4, %2) : f32[2,2]
          %6 = matmul(%x, %1) : f32[2,2]
          %7 = add(%6, %3) : f32[2,2]
          return %5, %7
        }
        """,
        """
        graph @g(%x: f32[2,9]) -> (f32[2,2], f32[2,2]) {
          %0 = constant() {value=array<f32[9,4]>[[1.0,2.0,2.0,1.0],[0.5,-1.0,-0.5,1.0],[0.25,3.0,0.75,-3.0],[1.0,2.0,1.5,0.0],[0.5,-1.0,0.5,-1.5],[0.25,3.0,0.25,3.5],[-1.0,-2.0,-1.0,2.0],[1.0,0.5,0.5,0.5],[2.0,-0.25,-2.0,1.0]]} : f32[9,4]
          %1 = matmul(%x, %0) : f32[2,4]
          %2 = constant() {value=array<f32[4]>[0.5,-0.5,1.5,2.5]} : f32[4]
          %3 = add(%1, %2) : f32[2,4]
          %4 = slice(%3) {starts=[0,0], steps=[1,1], stops=[4611686018427387904,2]} : f32[2,2]
          %5 = slice(%3) {starts=[0,2], steps=[1,1], stops=[4611686018427387904,4]} : f32[2,2]
          return %4, %5
        }
        """),
})
# slice_slice fires when merged slices are composed / cover a whole axis: the merge cases
CASES["slice_slice"] = CASES["merge_parallel_matmuls"]
# slice_identity fires when merged slices are composed / cover a whole axis: the merge cases
CASES["slice_identity"] = CASES["merge_sliced_bias_adds"]


def _text(s: str) -> str:
    return textwrap.dedent(s).strip("\n") + "\n"


OPT_IN = {"reassociate_constant_matmuls"}
"""Rules that change NaN/Inf semantics: they run only under ``reassociate=True``."""


def _rewrite(before: str, reassociate: bool = False):
    graph = parse_graph(_text(before))
    result = saturate(graph, reassociate=reassociate)
    return graph, result, dce(constant_fold(dce(result.graph)[0])[0])[0]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_rewrites(rule):
    before, after = CASES[rule]
    _, result, rewritten = _rewrite(before, reassociate=rule in OPT_IN)
    assert result.rules_fired.get(rule, 0) > 0
    assert result.stopped == "saturated"
    assert print_graph(rewritten) == _text(after)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_keeps_results(rule):
    graph, _, rewritten = _rewrite(CASES[rule][0], reassociate=rule in OPT_IN)
    rng = np.random.default_rng(sorted(CASES).index(rule))
    args = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    for got, want in zip(interpret(rewritten, *args), interpret(graph, *args), strict=True):
        assert got.dtype == want.dtype
        assert_close(got, want)


@pytest.mark.parametrize("rule", sorted(OPT_IN))
def test_opt_in_rules_do_not_fire_by_default(rule):
    graph, result, _ = _rewrite(CASES[rule][0])
    assert result.rules_fired.get(rule, 0) == 0
    assert not result.changed and result.graph is graph


def test_every_rule_has_a_case():
    assert rule_names() == set(CASES)


def test_a_graph_without_matches_is_returned_unchanged():
    graph = parse_graph(_text("""
        graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {
          %0 = add(%x, %b) : f32[2,3]
          %1 = exp(%0) : f32[2,3]
          return %1
        }
        """))
    result = saturate(graph)
    assert not result.changed and result.graph is graph
