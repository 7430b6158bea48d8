// A pickle machine that runs untrusted pickle programs without running code: values are built from the program's
// opcodes, and what a program asks to call (REDUCE), construct (NEWOBJ) or load (BINPERSID) is decided by a
// subclass that knows one kind of file — torch.save's state dicts (io/state_dict_program.cpp), the metadata of a
// PyTorch distributed checkpoint (io/dcp_metadata.cpp). Anything a subclass does not allow is refused by name.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardtrain::io {

// A value on the machine's stack. Every value is owned by the machine's arena and referred to by pointer: the memo
// and the stack share a dict filled after it was memoized, and a program may nest containers deeply or in cycles
// without recursion or leaks when they are freed.
struct Value;
using ValuePtr = Value*;
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor, kObject };
  Kind kind = Kind::kNone;
  int64_t i = 0;                                 // kBool, kInt
  double f = 0;                                  // kFloat
  std::string s;                                 // kString; kGlobal: "module.name"; kObject: its class's
  std::vector<ValuePtr> items;                   // kTuple, kList; kDict: key, value, key, value...
  std::unordered_map<std::string, size_t> keys;  // kDict: a string key's place in items
  ValuePtr state = nullptr;                      // kObject: what BUILD gave it (its fields' dict, or a tuple)
  at::Storage storage;                           // kStorage
  at::ScalarType dtype = at::kByte;              // kStorage
  at::Tensor tensor;                             // kTensor

  // kDict: the value under string key `key`, or nullptr.
  ValuePtr get(const std::string& key) const {
    auto it = keys.find(key);
    return it == keys.end() ? nullptr : items[it->second + 1];
  }
};

const char* kind_name(Value::Kind kind);

class PickleMachine {
 public:
  // `path` and `what` ("its state dict") name the program in messages: "<path>: cannot read <what>: <fault>".
  PickleMachine(std::string path, std::string what, const char* program, size_t size);
  virtual ~PickleMachine();
  PickleMachine(const PickleMachine&) = delete;
  PickleMachine& operator=(const PickleMachine&) = delete;

  // Runs the program to its STOP; the value it leaves (owned by the machine). Throws std::runtime_error naming the
  // fault: an opcode outside pickle's data opcodes, a truncated or inconsistent program, what the subclass refuses.
  ValuePtr run();
  size_t consumed() const { return pos_; }  // the program's bytes up to its STOP, once run

 protected:
  // REDUCE: `fn` ("module.name") called with `args`. The default refuses.
  virtual ValuePtr call(const std::string& fn, const std::vector<ValuePtr>& args);
  // NEWOBJ: an instance of class `cls` made with `args` (its fields come by BUILD). The default refuses.
  virtual ValuePtr new_object(const std::string& cls, const std::vector<ValuePtr>& args);
  // BINPERSID: the object persistent id `id` names. The default refuses.
  virtual ValuePtr persistent_load(const ValuePtr& id);
  // BUILD: `state` given to `target`. The default keeps an object's state and ignores a dict's (an OrderedDict's
  // _metadata, which tensors do not need); any other target is refused.
  virtual void build(const ValuePtr& target, const ValuePtr& state);

  [[noreturn]] void fail(const std::string& what) const;
  ValuePtr make(Value::Kind kind);
  ValuePtr expect(const ValuePtr& v, Value::Kind kind, const char* op) const;
  int64_t int_arg(const std::vector<ValuePtr>& args, size_t k, const std::string& fn) const;
  std::vector<int64_t> ints_arg(const std::vector<ValuePtr>& args, size_t k, const std::string& fn) const;

 private:
  // One group of opcodes each: true when `op` was the group's and has run.
  bool push_scalar(uint8_t op);      // None, booleans, integers, floats, strings
  bool build_container(uint8_t op);  // tuples, lists, dicts
  bool make_object(uint8_t op);      // globals, REDUCE, BUILD, NEWOBJ, persistent ids (the subclass's calls)
  bool use_memo(uint8_t op);         // the memo's puts and gets
  std::string take(uint64_t n);
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(size_t n);
  std::string line();
  ValuePtr top();
  ValuePtr pop();
  std::vector<ValuePtr> since_mark();
  void push_int(int64_t i);
  void push_string(std::string s);
  void push_global(std::string name);
  void push_sequence(Value::Kind kind, std::vector<ValuePtr> items, size_t popped = 0);
  void set_items(const ValuePtr& dict, const std::vector<ValuePtr>& items);

  std::string path_, what_;
  const char* p_;
  size_t size_, pos_ = 0;
  std::vector<std::unique_ptr<Value>> arena_;  // every value made, freed with the machine
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
};

}  // namespace shardtrain::io
