;; logs_apart.wat — a Valet placement policy written by hand, without the Rust SDK.
;;
;; Decision: files whose path ends with ".log" go to stream 1, everything else to
;; stream 0 (zoned, lifetime group 0, no rotation). A device with a single stream gets
;; everything in stream 0, so the answer is never "nonsense".
;;
;; How it speaks the ABI (policies/ABI.md, version 1):
;;
;; - No imports at all: the host refuses a policy that imports anything.
;; - Exports:
;;     memory              one 64 KiB page; nothing grows it.
;;     valet_abi_version   () -> i32, returns 1.
;;     valet_buffer        () -> i32, the address of the 4096-byte exchange buffer. Here a
;;                         fixed region at 1024 (8-byte aligned; 1024 + 4096 fits the page).
;;     valet_init          (max_streams: i32) -> (), optional: remembered in $max_streams.
;;     valet_place         (len: i32) -> i32: the host has written a request of `len`
;;                         bytes at the buffer's start:
;;                             +0 u32 tenant   +4 u8 reason   +6 u16 path length
;;                             +8 u64 size     +16 the path (UTF-8, no leading '/')
;;                         We write the 24-byte decision over it:
;;                             +0 u8 class (0 zoned)   +1 u8 flags   +2 u16 reserved
;;                             +4 u32 stream   +8 u32 group   +12 u32 rotate MiB
;;                             +16 u32 rotate seconds   +20 u32 reserved
;;                         and return 0; returning non-zero means "no opinion" (the host
;;                         then uses its default placement).
;;   valet_event is optional and left out: this policy learns nothing.
;;
;; Build: any WAT assembler, e.g. `wat2wasm logs_apart.wat` or `wasm-tools parse`; the
;; result can be checked with `valet-run policy check logs_apart.wasm`.
(module
  (memory (export "memory") 1)

  ;; The exchange buffer's address.
  (global $buffer i32 (i32.const 1024))
  ;; Streams the device can keep apart; 1 until the host tells us.
  (global $max_streams (mut i32) (i32.const 1))

  (func (export "valet_abi_version") (result i32)
    (i32.const 1))

  (func (export "valet_buffer") (result i32)
    (global.get $buffer))

  (func (export "valet_init") (param $max_streams i32)
    (global.set $max_streams (local.get $max_streams)))

  (func (export "valet_place") (param $len i32) (result i32)
    (local $path_len i32)
    (local $stream i32)
    ;; A request shorter than its header, or whose path runs past `len`: no opinion.
    (if (i32.lt_u (local.get $len) (i32.const 16))
      (then (return (i32.const 1))))
    (local.set $path_len (i32.load16_u offset=6 (global.get $buffer)))
    (if (i32.gt_u (i32.add (local.get $path_len) (i32.const 16)) (local.get $len))
      (then (return (i32.const 1))))
    ;; Do the last four bytes of the path read ".log"? Loaded as one little-endian u32:
    ;; '.' = 0x2e, 'l' = 0x6c, 'o' = 0x6f, 'g' = 0x67  ->  0x676f6c2e.
    (if (i32.ge_u (local.get $path_len) (i32.const 4))
      (then
        (if (i32.eq
              (i32.load offset=12   ;; buffer + 16 + path_len - 4
                (i32.add (global.get $buffer) (local.get $path_len)))
              (i32.const 0x676f6c2e))
          (then (local.set $stream (i32.const 1))))))
    ;; Never name a stream the device does not have.
    (if (i32.ge_u (local.get $stream) (global.get $max_streams))
      (then (local.set $stream (i32.const 0))))
    ;; The decision: all 24 bytes zero (zoned, no flags, group 0, no rotation, reserved
    ;; fields 0), then the stream at +4.
    (i64.store offset=0 (global.get $buffer) (i64.const 0))
    (i64.store offset=8 (global.get $buffer) (i64.const 0))
    (i64.store offset=16 (global.get $buffer) (i64.const 0))
    (i32.store offset=4 (global.get $buffer) (local.get $stream))
    (i32.const 0))
)
