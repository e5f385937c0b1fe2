"""MNN's schema enums as {value: NAME} tables.

The values and names are MNN's (schema/default/*.fbs); they are what an .mnn
file stores and what `mnnconvert`'s JSON dump prints. `OP_PARAMETER` is the
`OpParameter` union: 0 is NONE and members count up from 1 in schema order.
Only the enums that the decoded tables use are here.
"""

from __future__ import annotations


def enum_name(table: dict[int, str], value: int) -> str:
    """The NAME for `value`, or "UNKNOWN(value)" for a value this schema does not know."""
    return table.get(value, f"UNKNOWN({value})")


# OpType (int)
OP_TYPE: dict[int, str] = {
    0: 'AbsVal', 1: 'QuantizedAdd', 2: 'ArgMax', 3: 'AsString', 4: 'InstanceNorm', 5: 'BatchToSpaceND',
    6: 'Copy', 7: 'BinaryOp', 8: 'Bnll', 9: 'Cast', 10: 'Concat', 11: 'Const', 12: 'Convolution',
    13: 'ConvolutionDepthwise', 14: 'Crop', 15: 'CropAndResize', 16: 'ImageProcess',
    17: 'Deconvolution', 18: 'DeconvolutionDepthwise', 19: 'Dequantize', 20: 'DetectionOutput',
    21: 'Dropout', 22: 'Eltwise', 23: 'ELU', 24: 'Unique', 25: 'Exp', 26: 'ExpandDims', 27: 'Fill',
    28: 'Flatten', 29: 'Im2Col', 30: 'Gather', 31: 'GatherV2', 32: 'Im2Seq', 33: 'InnerProduct',
    34: 'Input', 35: 'Interp', 36: 'Log', 37: 'LRN', 38: 'LSTM', 39: 'MatMul', 40: 'MoE',
    41: 'NonMaxSuppression', 42: 'NonMaxSuppressionV2', 43: 'Normalize', 44: 'Pack', 45: 'Padding',
    46: 'Permute', 47: 'Pooling', 48: 'Power', 49: 'PReLU', 50: 'PriorBox', 51: 'Proposal',
    52: 'QuantizedAvgPool', 53: 'QuantizedBiasAdd', 54: 'QuantizedConcat',
    55: 'QuantizedDepthwiseConv2D', 56: 'QuantizedLogistic', 57: 'RasterAndInterpolate',
    58: 'QuantizedMaxPool', 59: 'Texture', 60: 'RasterDiff', 61: 'QuantizedReshape',
    62: 'QuantizedSoftmax', 63: 'QuantizeMaxMin', 64: 'QuantizeV2', 65: 'Range', 66: 'Rank',
    67: 'ReduceJoin', 68: 'Reduction', 69: 'ReLU', 70: 'ReLU6', 71: 'RequantizationRange',
    72: 'Requantize', 73: 'Reshape', 74: 'Resize', 75: 'RNN', 76: 'ROIPooling', 77: 'Scale', 78: 'Selu',
    79: 'Seq2Out', 80: 'Shape', 81: 'Sigmoid', 82: 'Size', 83: 'Slice', 84: 'SliceTf', 85: 'Softmax',
    86: 'SpaceToBatchND', 87: 'SpatialProduct', 88: 'Col2Im', 89: 'Segment', 90: 'Squeeze',
    91: 'StridedSlice', 92: 'CastLike', 93: 'StringSplit', 94: 'StringToNumber', 95: 'TanH',
    96: 'TfQuantizedConv2D', 97: 'Threshold', 98: 'Tile', 99: 'TopKV2', 100: 'Transpose',
    101: 'UnaryOp', 102: 'Unpack', 103: 'Where', 104: 'Moments', 105: 'RNNSequenceGRU',
    106: 'BatchMatMul', 107: 'Unsqueeze', 108: 'CosineSimilarity', 109: 'DepthToSpace',
    110: 'SpaceToDepth', 111: 'ReverseSequence', 112: 'Pooling3D', 113: 'Convolution3D',
    114: 'MatrixBandPart', 115: 'GatherND', 116: 'DetectionPostProcess', 117: 'UnravelIndex',
    118: 'ScatterNd', 119: 'OneHot', 120: 'BroadcastTo', 121: 'Dilation2D', 122: 'Interp3D',
    128: 'Raster', 129: 'ConvertTensor', 130: 'ArgMin', 131: 'LinSpace', 132: 'RandomUniform',
    133: 'TensorArray', 134: 'TensorArraySize', 135: 'TensorArrayRead', 136: 'TensorArrayWrite',
    137: 'TensorArrayGather', 138: 'TensorArrayScatter', 139: 'TensorArraySplit',
    140: 'TensorArrayConcat', 141: 'LSTMBlockCell', 142: 'Reverse', 143: 'ROIAlign',
    144: 'RandomNormal', 145: 'TensorArrayInsert', 146: 'TensorArrayErase', 147: 'EyeLike',
    148: 'CumSum', 149: 'Det', 150: 'CumProd', 151: 'ScatterElements', 152: 'GatherElements',
    153: 'Svd', 154: 'Histogram', 155: 'DynamicQuant', 156: 'Stft', 256: 'Plugin', 257: 'Select',
    258: 'ZerosLike', 259: 'Broastcast', 260: 'SetDiff1D', 261: 'ReluGrad', 262: 'Identity',
    263: 'PoolGrad', 264: 'SoftmaxGrad', 265: 'Conv2DBackPropFilter', 266: 'TrainableParam',
    267: 'BatchNorm', 268: 'ConvTranspose3D', 269: 'ZeroGrad', 299: 'Attention', 300: 'FmhaV2',
    301: 'Fmhca', 302: 'SeqLen2Spatial', 303: 'SplitGeLU', 304: 'GroupNorm', 305: 'LinearAttention',
    306: 'RoPE', 307: 'FusedLinear', 308: 'GatedRMSNorm', 512: 'Extra', 513: 'ConvInt8',
    514: 'Int8ToFloat', 515: 'DepthwiseConvInt8', 517: 'FloatToInt8', 518: 'EltwiseInt8', 600: 'While',
    601: 'If', 603: 'LayerNorm', 604: 'GridSample',
}


# DataType (int)
DATA_TYPE: dict[int, str] = {
    0: 'DT_INVALID', 1: 'DT_FLOAT', 2: 'DT_DOUBLE', 3: 'DT_INT32', 4: 'DT_UINT8', 5: 'DT_INT16',
    6: 'DT_INT8', 7: 'DT_STRING', 8: 'DT_COMPLEX64', 9: 'DT_INT64', 10: 'DT_BOOL', 11: 'DT_QINT8',
    12: 'DT_QUINT8', 13: 'DT_QINT32', 14: 'DT_BFLOAT16', 15: 'DT_QINT16', 16: 'DT_QUINT16',
    17: 'DT_UINT16', 18: 'DT_COMPLEX128', 19: 'DT_HALF', 20: 'DT_RESOURCE', 21: 'DT_VARIANT',
}


# MNN_DATA_FORMAT (byte)
DATA_FORMAT: dict[int, str] = {
    0: 'NCHW', 1: 'NHWC', 2: 'NC4HW4', 3: 'NHWC4', 4: 'UNKNOWN',
}


# BinaryOpOperation (int)
BINARY_OP: dict[int, str] = {
    0: 'ADD', 1: 'SUB', 2: 'MUL', 3: 'DIV', 4: 'MAX_TEMP', 5: 'MIN_TEMP', 6: 'POW', 7: 'REALDIV',
    8: 'MINIMUM', 9: 'MAXIMUM', 10: 'GREATER', 11: 'GREATER_EQUAL', 12: 'LESS', 13: 'FLOORDIV',
    14: 'SquaredDifference', 15: 'EQUAL', 16: 'LESS_EQUAL', 17: 'FLOORMOD', 19: 'MOD', 20: 'ATAN2',
    21: 'LOGICALOR', 22: 'NOTEQUAL', 23: 'BITWISE_AND', 24: 'BITWISE_OR', 25: 'BITWISE_XOR',
    26: 'LOGICALXOR', 27: 'LEFTSHIFT', 28: 'RIGHTSHIFT', 29: 'MUL_SILU',
}


# UnaryOpOperation (int)
UNARY_OP: dict[int, str] = {
    0: 'ABS', 1: 'NEG', 2: 'FLOOR', 3: 'CEIL', 4: 'SQUARE', 5: 'SQRT', 6: 'RSQRT', 7: 'EXP', 8: 'LOG',
    9: 'SIN', 10: 'COS', 11: 'TAN', 12: 'ASIN', 13: 'ACOS', 14: 'ATAN', 15: 'RECIPROCAL', 16: 'LOG1P',
    17: 'BNLL', 18: 'ACOSH', 19: 'SINH', 20: 'ASINH', 21: 'ATANH', 22: 'SIGN', 23: 'ROUND', 24: 'COSH',
    25: 'ERF', 26: 'ERFC', 27: 'ERFINV', 28: 'EXPM1', 29: 'SIGMOID', 30: 'TANH', 31: 'HARDSWISH',
    32: 'GELU', 33: 'GELU_STANDARD', 34: 'SILU',
}


# PadMode (byte)
PAD_MODE: dict[int, str] = {
    0: 'CAFFE', 1: 'VALID', 2: 'SAME',
}

# PoolType, PoolPadType, AvgPoolCountType (byte)
POOL_TYPE: dict[int, str] = {0: 'MAXPOOL', 1: 'AVEPOOL'}
POOL_PAD_TYPE: dict[int, str] = {0: 'CAFFE', 1: 'VALID', 2: 'SAME'}
AVG_POOL_COUNT_TYPE: dict[int, str] = {0: 'DEFAULT', 1: 'INCLUDE_PADDING', 2: 'EXCLUDE_PADDING'}


# ScaleStorageType (byte)
SCALE_STORAGE: dict[int, str] = {
    0: 'FP32', 1: 'FP16',
}


# SparseAlgo (byte)
SPARSE_ALGO: dict[int, str] = {
    0: 'RANDOM', 1: 'SIMD_OC',
}


# QuantizeAlgo (byte)
QUANTIZE_ALGO: dict[int, str] = {
    0: 'DEFAULT', 1: 'OVERFLOW_AWARE', 2: 'WINOGRAD_AWARE',
}


# NetSource (byte)
NET_SOURCE: dict[int, str] = {
    0: 'CAFFE', 1: 'TENSORFLOW', 2: 'TFLITE', 3: 'ONNX', 4: 'TORCH',
}


# Usage (byte)
USAGE: dict[int, str] = {
    0: 'INFERENCE', 1: 'TRAIN', 2: 'INFERENCE_STATIC',
}


# ForwardType (byte)
FORWARD_TYPE: dict[int, str] = {
    0: 'CPU', 1: 'METAL', 2: 'CUDA', 3: 'OPENCL', 4: 'AUTO', 5: 'NNAPI', 6: 'OPENGLES', 7: 'VULKAN',
}


# ReductionType (byte)
REDUCTION_TYPE: dict[int, str] = {
    0: 'SUM', 1: 'ASUM', 2: 'SUMSQ', 3: 'MEAN', 4: 'MAXIMUM', 5: 'MINIMUM', 6: 'PROD', 7: 'ANY',
    8: 'ALL',
}


# EltwiseType (byte)
ELTWISE_TYPE: dict[int, str] = {
    0: 'PROD', 1: 'SUM', 2: 'MAXIMUM', 3: 'SUB',
}


# union OpParameter: the value written in Op.main_type
OP_PARAMETER: dict[int, str] = {
    0: 'NONE', 1: 'QuantizedAdd', 2: 'ArgMax', 3: 'AsString', 4: 'Axis', 5: 'BatchNorm', 6: 'BinaryOp',
    7: 'Blob', 8: 'CastParam', 9: 'Convolution2D', 10: 'Crop', 11: 'CropAndResize', 12: 'Dequantize',
    13: 'DetectionOutput', 14: 'Eltwise', 15: 'ExpandDims', 16: 'Fill', 17: 'Flatten', 18: 'Gather',
    19: 'GatherV2', 20: 'InnerProduct', 21: 'Input', 22: 'Interp', 23: 'LRN', 24: 'LSTM', 25: 'MatMul',
    26: 'NonMaxSuppressionV2', 27: 'Normalize', 28: 'PackParam', 29: 'Permute', 30: 'Plugin',
    31: 'Pool', 32: 'PRelu', 33: 'PriorBox', 34: 'Proposal', 35: 'QuantizedAvgPool',
    36: 'QuantizedBiasAdd', 37: 'QuantizedConcat', 38: 'QuantizedLogistic', 39: 'QuantizedMatMul',
    40: 'QuantizedMaxPool', 41: 'QuantizedRelu', 42: 'QuantizedRelu6', 43: 'QuantizedReshape',
    44: 'QuantizedSoftmax', 45: 'QuantizeMaxMin', 46: 'QuantizeV2', 47: 'Range', 48: 'Rank',
    49: 'ReduceJoin', 50: 'ReductionParam', 51: 'Relu', 52: 'Relu6', 53: 'RequantizationRange',
    54: 'Requantize', 55: 'Reshape', 56: 'Resize', 57: 'RoiParameters', 58: 'Scale', 59: 'Selu',
    60: 'Size', 61: 'Slice', 62: 'SliceTf', 63: 'SpaceBatch', 64: 'SqueezeParam',
    65: 'StridedSliceParam', 66: 'TensorConvertInfo', 67: 'TfQuantizedConv2D', 68: 'TopKV2',
    69: 'Transpose', 70: 'UnaryOp', 71: 'MomentsParam', 72: 'RNNParam', 73: 'BatchMatMulParam',
    74: 'QuantizedFloatParam', 75: 'DepthSpaceParam', 76: 'EltwiseInt8', 77: 'ReverseSequenceParam',
    78: 'Extra', 79: 'Pool3D', 80: 'Convolution3D', 81: 'ELU', 82: 'DetectionPostProcessParam',
    83: 'OneHotParam', 84: 'PadParam', 85: 'WhileParam', 86: 'IfParam', 87: 'RandomUniform',
    88: 'LayerNorm', 89: 'TensorArray', 90: 'LSTMBlockCell', 91: 'GridSample', 92: 'LoopParam',
    93: 'ImageProcessParam', 94: 'CumSum', 95: 'GroupNorm', 96: 'FmhaV2Param', 97: 'FmhcaParam',
    98: 'AttentionParam', 99: 'StftParam', 100: 'LinearAttentionParam', 101: 'ShapeParam',
    102: 'RoPEParam', 103: 'FusedLinearParam',
}

